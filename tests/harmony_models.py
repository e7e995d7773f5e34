"""HarmonyBatch model coefficients for tests, as a state folder's harmony-models.json holds them.

VGG-19's latency/cost coefficients from HarmonyBatch's model.json (numbers from
icloud-ecnu/HarmonyBatch, MIT): the provider's HarmonyBatch pools, its deploy-time validation,
`faas-gpu fit` and the live HarmonyBatch test all plan with the same model.
"""

VGG19 = {
    "CPU": {
        "mem": [36.57142857, 807.6190476],
        "avg": {
            "Exponential": [
                [1.8260695578676214, 0.5283726420022545, 0.18015427168547402],
                [4.849070286817897, 0.4322505914521466, 0.3644750704985931],
                [6.525043654279533, 0.45923392645406674, 0.533468087304086],
                [8.922555068657605, 0.4484733129911248, 0.7569893954072374],
            ]
        },
        "max": {
            "Exponential": [
                [2.8046821487917626, 0.4861966854235096, 0.2486015254149421],
                [4.9219043468043475, 0.48909337170637446, 0.3932803431571859],
                [6.9439000301849525, 0.5051632662978255, 0.5695388754016029],
                [9.65159701751372, 0.46592585483072324, 0.8287713748262584],
            ]
        },
    },
    "GPU": {
        "mem": 512,
        "gpu_mem": [0],
        "A10": {"l1": 0.001679844365532822, "l2": 0.002113091944793135, "t": 0.002, "G": 24},
    },
}
